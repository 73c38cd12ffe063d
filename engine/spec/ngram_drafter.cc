#include "engine/spec/ngram_drafter.h"

#include <algorithm>

namespace sluice {

std::vector<int32_t> NgramLookup(absl::Span<const int32_t> tokens, int32_t k,
                                 const NgramOptions& options) {
  std::vector<int32_t> out;
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k <= 0) return out;
  for (int64_t n = std::min<int64_t>(options.max_n, len - 1); n >= std::max(1, options.min_n);
       --n) {
    const int32_t* suffix = tokens.data() + len - n;
    // Most recent earlier occurrence: start at len - n - 1 (the suffix itself excluded).
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix, suffix + n, tokens.data() + i)) continue;
      const int64_t from = i + n;
      const int64_t to = std::min<int64_t>(len, from + k);
      out.assign(tokens.begin() + from, tokens.begin() + to);
      return out;
    }
  }
  return out;
}

absl::Status NgramDrafter::Propose(absl::Span<const DraftInput> inputs,
                                   const DraftContinue& keep_going,
                                   std::vector<DraftOutput>* outputs) {
  outputs->resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    DraftOutput& out = (*outputs)[i];
    out.Clear();
    out.tokens = NgramLookup(inputs[i].token_ids, inputs[i].max_draft_tokens, options_);
    // One-hot proposals: confidence 1 before calibration. The scheduler's calibrated mapping
    // turns it into the measured acceptance, and may cut the proposal short.
    for (size_t j = 0; j < out.tokens.size(); ++j) {
      out.confidence.push_back(1.0f);
      if (keep_going && !keep_going(i, static_cast<int32_t>(j), 1.0f)) {
        out.tokens.resize(j + 1);
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
