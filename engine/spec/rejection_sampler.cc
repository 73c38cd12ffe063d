#include "engine/spec/rejection_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/sampling/logits_processing.h"

namespace sluice {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kGreedyTemperature = 1e-5f;  // SampleToken's

// Draws an id from unnormalized weights with one uniform; the last positive id on rounding.
int32_t DrawWeighted(const std::vector<double>& w, double u) {
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0.0) continue;
    cumulative += w[i];
    last = static_cast<int32_t>(i);
    if (cumulative > target) return last;
  }
  return std::max(last, 0);
}

}  // namespace

void TargetProbs(absl::Span<float> logits, const SamplingParams& params,
                 const SequenceContext& context, std::vector<double>* probs) {
  const size_t vocab = logits.size();
  probs->assign(vocab, 0.0);
  if (vocab == 0) return;
  // SampleToken's processing, in its order.
  if (static_cast<int64_t>(context.output_token_ids.size()) < params.min_tokens) {
    kernels::SuppressTokensCpu(logits, context.eos_token_ids);
  }
  kernels::ApplyPenaltiesCpu(
      logits, {params.repetition_penalty, params.frequency_penalty, params.presence_penalty},
      context.prompt_token_ids, context.output_token_ids);
  if (params.temperature != 1.0f) {
    for (float& l : logits) l /= params.temperature;
  }
  float max_logit = kNegInf;
  for (float l : logits) max_logit = std::max(max_logit, l);
  if (!(max_logit > kNegInf)) {  // SampleRandom's fallback: the argmax, i.e. id 0 here
    (*probs)[std::max_element(logits.begin(), logits.end()) - logits.begin()] = 1.0;
    return;
  }
  if (params.min_p > 0.0f) {
    const double log_min_p = std::log(static_cast<double>(params.min_p));
    for (float& l : logits) {
      if (static_cast<double>(l) - max_logit < log_min_p) l = kNegInf;
    }
  }
  std::vector<int32_t> kept;
  for (size_t i = 0; i < vocab; ++i) {
    if (logits[i] > kNegInf) kept.push_back(static_cast<int32_t>(i));
  }
  auto weight = [&](int32_t id) { return std::exp(static_cast<double>(logits[id]) - max_logit); };
  const bool use_top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  if (use_top_k || params.top_p < 1.0f) {
    // Descending value, lower id first on ties (SampleToken's RankDescending).
    std::sort(kept.begin(), kept.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    if (use_top_k && static_cast<size_t>(params.top_k) < kept.size()) kept.resize(params.top_k);
    if (params.top_p < 1.0f) {
      double total = 0.0;
      for (int32_t id : kept) total += weight(id);
      const double threshold = static_cast<double>(params.top_p) * total;
      double mass = 0.0;
      for (size_t i = 0; i < kept.size(); ++i) {
        mass += weight(kept[i]);
        if (mass >= threshold) {
          kept.resize(i + 1);
          break;
        }
      }
    }
  }
  double total = 0.0;
  for (int32_t id : kept) total += weight(id);
  for (int32_t id : kept) (*probs)[id] = weight(id) / total;
}

void RejectionRule::Residual(const std::vector<double>& p, absl::Span<const float> q,
                             int32_t draft, std::vector<double>* out) const {
  out->resize(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double qi = q.empty() ? (static_cast<int32_t>(i) == draft ? 1.0 : 0.0) : q[i];
    (*out)[i] = std::max(0.0, p[i] - qi);
  }
}

VerifiedToken VerifyRow(absl::Span<float> logits, const SamplingParams& params,
                        const SequenceContext& context, const std::optional<DraftToken>& draft,
                        const SampleDrawKey& key, const RejectionRule& rule) {
  VerifiedToken out;
  // Greedy rows, the bonus row, and a deterministic proposal (q = one-hot(d)): the position's
  // own SampleToken draw, the draft accepted when it is that token. For a one-hot q this is
  // exact with the rule's acceptance probability, min(1, p(d) / 1) = p(d), and the token is the
  // one the position gets without speculation, whatever the drafts and however many of them a
  // step verifies: a seed gives the same output with or without speculation.
  if (params.temperature < kGreedyTemperature || !draft.has_value() || draft->probs.empty()) {
    out.token = SampleToken(logits, params, context, key);
    out.accepted = draft.has_value() && out.token.token_id == draft->token_id;
    return out;
  }
  thread_local std::vector<float> raw;
  thread_local std::vector<double> p, residual;
  raw.assign(logits.begin(), logits.end());
  TargetProbs(logits, params, context, &p);
  const int32_t d = draft->token_id;
  const double q = static_cast<double>(draft->probs[d]);
  int32_t token;
  if (rule.Accept(p[d], q, DrawUniform(key, kAcceptDraw))) {
    token = d;
    out.accepted = true;
  } else {
    rule.Residual(p, draft->probs, d, &residual);
    // An all-zero residual (p <= q everywhere: p == q up to rounding) only follows a rejection
    // of probability ~0; p is then the right distribution.
    const bool empty = std::all_of(residual.begin(), residual.end(), [](double r) { return r <= 0.0; });
    token = DrawWeighted(empty ? p : residual, DrawUniform(key, kTokenDraw));
  }
  const absl::Span<const float> raw_span(raw);
  const double log_sum_exp = kernels::LogSumExpCpu(raw_span);
  out.token.token_id = token;
  out.token.logprob = static_cast<float>(static_cast<double>(raw[token]) - log_sum_exp);
  if (params.logprobs.has_value() && *params.logprobs > 0) {
    out.token.top_logprobs =
        kernels::TopLogprobsCpu(raw_span, log_sum_exp, static_cast<size_t>(*params.logprobs));
  }
  return out;
}

}  // namespace sluice
