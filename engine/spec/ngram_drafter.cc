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

void NgramDrafter::Release(std::string_view request_id) {
  history_.erase(std::string(request_id));
}

absl::Status NgramDrafter::Propose(absl::Span<const DraftInput> inputs,
                                   const DraftContinue& keep_going,
                                   std::vector<DraftOutput>* outputs) {
  outputs->resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    DraftOutput& out = (*outputs)[i];
    out.Clear();
    auto [it, fresh] = history_.try_emplace(std::string(in.request_id));
    History& h = it->second;
    if (fresh) h.agreement = pooled_;
    // Score the last proposal against what followed: tokens agree up to the first mismatch,
    // which counts too; tokens not yet generated are not compared.
    const int64_t len = static_cast<int64_t>(in.token_ids.size());
    const int64_t proposed = static_cast<int64_t>(h.proposal.size());
    for (int64_t j = 0; h.start >= 0 && j < proposed && h.start + j < len; ++j) {
      const bool agreed = in.token_ids[h.start + j] == h.proposal[j];
      h.agreement += kAgreementWeight * ((agreed ? 1.0 : 0.0) - h.agreement);
      pooled_ += kPooledWeight * ((agreed ? 1.0 : 0.0) - pooled_);
      if (!agreed) break;
    }
    out.tokens = NgramLookup(in.token_ids, in.max_draft_tokens, options_);
    h.start = out.tokens.empty() ? -1 : len;
    h.proposal = out.tokens;
    // One-hot proposals (q is a point mass); the scheduler may cut them short.
    const float confidence = static_cast<float>(h.agreement);
    for (size_t j = 0; j < out.tokens.size(); ++j) {
      out.confidence.push_back(confidence);
      if (keep_going && !keep_going(i, static_cast<int32_t>(j), confidence)) {
        out.tokens.resize(j + 1);
        out.confidence.resize(j + 1);
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
