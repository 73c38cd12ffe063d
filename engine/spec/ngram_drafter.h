// NgramDrafter: prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"; vLLM's
// `--speculative-method ngram`). The longest suffix of the sequence (max_n down to min_n tokens)
// that occurred earlier in it — prompt or output — is matched at its most recent earlier
// occurrence, and the tokens that followed that occurrence are proposed. Deterministic, no model:
// it pays off on workloads that quote or summarize their prompt.
#ifndef SLUICE_ENGINE_SPEC_NGRAM_DRAFTER_H_
#define SLUICE_ENGINE_SPEC_NGRAM_DRAFTER_H_

#include <cstdint>
#include <string>
#include <unordered_map>
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

// Confidence: a lookup has no probability of its own, so every token of a proposal gets the
// request's running agreement rate — how often its earlier proposals matched the tokens that
// actually followed (an exponential average over the tokens compared). A new request starts
// from the drafter's pooled rate — the same average over every request's compared tokens, with
// a smaller weight, kPriorAgreement before any — so on a workload whose lookups agree its first
// proposals are verified too. Sequences that quote their prompt then rank above those whose
// lookups keep missing, and the confidence scheduler's calibration turns the rate into a
// measured acceptance.
class NgramDrafter final : public Drafter {
 public:
  static constexpr double kPriorAgreement = 0.5;
  static constexpr double kAgreementWeight = 0.25;  // weight of each newly compared token
  static constexpr double kPooledWeight = 0.05;     // the same for the pooled rate

  explicit NgramDrafter(const NgramOptions& options = {}) : options_(options) {}
  std::string_view method() const override { return "ngram"; }
  absl::Status Propose(absl::Span<const DraftInput> inputs, const DraftContinue& keep_going,
                       std::vector<DraftOutput>* outputs) override;
  void Release(std::string_view request_id) override;

 private:
  struct History {
    int64_t start = -1;              // position of the last proposal's first token
    std::vector<int32_t> proposal;   // the last lookup's tokens
    double agreement = kPriorAgreement;
  };
  NgramOptions options_;
  double pooled_ = kPriorAgreement;
  std::unordered_map<std::string, History> history_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_NGRAM_DRAFTER_H_
