// Verification of draft tokens against the target's logits (speculative sampling).
//
// Greedy rows: the target's token is SampleToken's (argmax after SampleToken's processing); a
// draft is accepted when it equals it, so greedy output is token for token the output without
// speculation.
// Sampled rows, draft d proposed from a distribution q (a draft model sampling at the request's
// temperature): d is accepted with probability min(1, p(d) / q(d)), p being the distribution
// SampleToken samples from (penalties, temperature, min_p, top_k, top_p); after a rejection the
// token is drawn from norm(max(0, p - q)), and after k accepted drafts the bonus token from p.
// The emitted tokens are then distributed exactly as under p (Leviathan et al. 2023,
// arXiv:2211.17192, Theorem 1; Chen et al. 2023, arXiv:2302.01318).
// Sampled rows with a deterministic proposal (n-gram: q = one-hot(d)): the token is SampleToken's
// own draw and d is accepted when it is that token. The acceptance probability is the rule's,
// p(d), and the output is the output without speculation, draw for draw.
// Logprobs reported are the target's raw ones, as SampleToken's.
#ifndef SLUICE_ENGINE_SPEC_REJECTION_SAMPLER_H_
#define SLUICE_ENGINE_SPEC_REJECTION_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace sluice {

// TargetProbs writes into `probs` [vocab] the distribution SampleToken(logits, params, context)
// draws from for a non-greedy request (zero outside the tokens min_p / top_k / top_p keep).
// `logits` is modified as scratch.
void TargetProbs(absl::Span<float> logits, const SamplingParams& params,
                 const SequenceContext& context, std::vector<double>* probs);

// RejectionRule: the acceptance test and the distribution after a rejection of a draft proposed
// from a distribution q. The default is the exact rule above; it is an object so tests can show
// that a wrong rule is caught (the statistical test of tests/golden/spec_distribution_test.cc).
class RejectionRule {
 public:
  virtual ~RejectionRule() = default;
  // True when a draft with target probability p and draft probability q is accepted under the
  // uniform draw u in [0, 1): u < min(1, p / q).
  virtual bool Accept(double p, double q, double u) const { return u * q < p; }
  // Residual fills `out` [vocab] with the (unnormalized) distribution to sample after draft
  // `draft` was rejected: max(0, p - q), q being `q` or one-hot(draft) when `q` is empty.
  virtual void Residual(const std::vector<double>& p, absl::Span<const float> q, int32_t draft,
                        std::vector<double>* out) const;
};

// A draft token offered for one verification row.
struct DraftToken {
  int32_t token_id = 0;
  absl::Span<const float> probs;  // q [vocab]; empty: deterministic proposal
};

struct VerifiedToken {
  SampledToken token;
  bool accepted = false;  // the token is the draft's (verification may go on to the next row)
};

// VerifyRow verifies one row: `logits` [vocab] are the target's logits after the sequence's
// tokens so far (context); `draft` is the draft token at this position, or nullopt for the bonus
// row (then the token is SampleToken's). Draws are keyed by `key`, the position's draw key: the
// acceptance test takes kAcceptDraw, the token after a rejection and the bonus token kTokenDraw
// (as SampleToken), so the position's token keeps its key with and without a draft.
// `logits` is modified as scratch.
VerifiedToken VerifyRow(absl::Span<float> logits, const SamplingParams& params,
                        const SequenceContext& context, const std::optional<DraftToken>& draft,
                        const SampleDrawKey& key, const RejectionRule& rule);

}  // namespace sluice

#endif  // SLUICE_ENGINE_SPEC_REJECTION_SAMPLER_H_
