// NgramDrafter: prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"; vLLM's
// `--speculative-method ngram`). The longest suffix of the sequence (max_n down to min_n tokens)
// that occurred earlier in it — prompt or output — is matched at its most recent earlier
// occurrence, and the tokens that followed that occurrence are proposed. Deterministic, no model:
// it pays off on workloads that quote or summarize their prompt.
#ifndef SLUICE_ENGINE_SPEC_NGRAM_DRAFTER_H_
#define SLUICE_ENGINE_SPEC_NGRAM_DRAFTER_H_

#include <cstdint>
#include <vector>

#include "engine/spec/drafter.h"

namespace sluice {

struct NgramOptions {
  int32_t min_n = 2;  // shortest suffix matched
  int32_t max_n = 4;  // longest suffix matched
};

// NgramLookup returns up to `k` tokens that followed the most recent earlier occurrence of the
// longest suffix of `tokens` of length in [min_n, max_n]; empty when none occurs.
std::vector<int32_t> NgramLookup(absl::Span<const int32_t> tokens, int32_t k,
                                 const NgramOptions& options);

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const NgramOptions& options = {}) : options_(options) {}
  std::string_view method() const override { return "ngram"; }
  absl::Status Propose(absl::Span<const DraftInput> inputs, const DraftContinue& keep_going,
                       std::vector<DraftOutput>* outputs) override;

 private:
  NgramOptions options_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_NGRAM_DRAFTER_H_
