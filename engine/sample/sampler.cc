// SampleToken: per-sequence logits processing and token choice (see sampler.h).
//
// Semantics follow vLLM v1 (vllm/v1/sample/sampler.py, vllm/model_executor/layers/utils.py
// apply_penalties, vllm/v1/sample/ops/topk_topp_sampler.py):
//  - min_tokens: EOS and stop token ids get -inf while fewer than min_tokens were generated.
//  - repetition_penalty (CTRL, Keskar et al. 2019, arXiv:1909.05858): for every token that
//    occurs in the prompt or the output, logit > 0 → logit / p, else logit * p.
//  - presence / frequency penalties (OpenAI API reference): over OUTPUT tokens only,
//    logit -= frequency * count, then logit -= presence * (count > 0).
//  - temperature < 1e-5 (vLLM's _SAMPLING_EPS) → greedy argmax, lowest id on ties.
//  - otherwise logits / T, then min_p (drop p_i < min_p * p_max), top_k, then top_p over the
//    distribution renormalized after top_k (smallest prefix of the descending order whose mass
//    reaches top_p, at least one token), then one categorical draw.
// The draw uses u = DrawUniform(key) (Philox4x32-10 keyed by seed, choice and position): exact,
// platform-independent, and independent of any other draw.
#include "engine/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "engine/sample/token_constraints.h"
#include "kernels/sampling/logits_processing.h"

namespace sluice {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// vLLM's _SAMPLING_EPS: temperatures below it are treated as greedy.
constexpr float kGreedyTemperature = 1e-5f;
// Initial size of the sorted prefix when top_p needs the descending order without top_k.
constexpr size_t kInitialSortedPrefix = 64;

// Ranks token a before token b: higher value first, then lower id.
struct RankDescending {
  const float* values;
  bool operator()(int32_t a, int32_t b) const {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  }
};

// Argmax with the lowest id on ties; NaN never wins; all -inf/NaN → 0.
int32_t Argmax(absl::Span<const float> logits) {
  int32_t best_id = 0;
  float best = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best) {
      best = logits[i];
      best_id = static_cast<int32_t>(i);
    }
  }
  return best_id;
}

// Draws from softmax(logits) restricted to finite entries; `max_logit` is their maximum.
// Walks ids in ascending order: O(V), no sort.
int32_t DrawUnsorted(absl::Span<const float> logits, float max_logit, double uniform) {
  double total = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > kNegInf) total += std::exp(static_cast<double>(logits[i]) - max_logit);
  }
  const double target = uniform * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!(logits[i] > kNegInf)) continue;
    cumulative += std::exp(static_cast<double>(logits[i]) - max_logit);
    last = static_cast<int32_t>(i);
    if (cumulative > target) return last;
  }
  return last;  // only reached through rounding at the top end
}

// Applies top_k / top_p and draws, walking candidates in descending order. Sorts only the
// prefix it needs: nth_element + sort of k entries for top_k, a doubling sorted prefix for
// top_p alone.
int32_t DrawTopKTopP(absl::Span<const float> logits, float max_logit, int32_t top_k, float top_p,
                     double uniform) {
  thread_local std::vector<int32_t> candidates;
  candidates.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > kNegInf) candidates.push_back(static_cast<int32_t>(i));
  }
  const RankDescending rank{logits.data()};
  auto first = candidates.begin();
  size_t sorted_end = 0;
  if (top_k > 0 && static_cast<size_t>(top_k) < candidates.size()) {
    std::nth_element(first, first + top_k, candidates.end(), rank);
    candidates.resize(top_k);
    std::sort(candidates.begin(), candidates.end(), rank);
    sorted_end = candidates.size();
  }
  const size_t n = candidates.size();
  // Extends the sorted prefix to cover [0, upto).
  auto ensure_sorted = [&](size_t upto) {
    if (upto <= sorted_end) return;
    const size_t new_end = std::min(n, std::max({upto, 2 * sorted_end, kInitialSortedPrefix}));
    if (new_end < n) std::nth_element(first + sorted_end, first + new_end, first + n, rank);
    std::sort(first + sorted_end, first + new_end, rank);
    sorted_end = new_end;
  };
  auto weight = [&](size_t rank_index) {
    return std::exp(static_cast<double>(logits[candidates[rank_index]]) - max_logit);
  };

  size_t keep = n;
  double kept_mass = 0.0;
  if (top_p < 1.0f) {
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += weight(i);
    const double threshold = static_cast<double>(top_p) * total;
    for (size_t i = 0; i < n; ++i) {
      ensure_sorted(i + 1);
      kept_mass += weight(i);
      if (kept_mass >= threshold) {
        keep = i + 1;
        break;
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) kept_mass += weight(i);
  }
  const double target = uniform * kept_mass;
  double cumulative = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    ensure_sorted(i + 1);
    cumulative += weight(i);
    if (cumulative > target) return candidates[i];
  }
  return candidates[keep - 1];
}

int32_t SampleRandom(absl::Span<float> logits, const SamplingParams& params, double uniform) {
  if (params.temperature != 1.0f) {
    for (float& logit : logits) logit /= params.temperature;
  }
  float max_logit = kNegInf;
  for (float logit : logits) max_logit = std::max(max_logit, logit);
  if (!(max_logit > kNegInf)) return Argmax(logits);  // nothing to draw from
  if (params.min_p > 0.0f) {
    // p_i < min_p * p_max  ⇔  logit_i - max_logit < log(min_p)
    const double log_min_p = std::log(static_cast<double>(params.min_p));
    for (float& logit : logits) {
      if (static_cast<double>(logit) - max_logit < log_min_p) logit = kNegInf;
    }
  }
  const bool use_top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < logits.size();
  if (!use_top_k && params.top_p >= 1.0f) return DrawUnsorted(logits, max_logit, uniform);
  return DrawTopKTopP(logits, max_logit, use_top_k ? params.top_k : 0, params.top_p, uniform);
}

}  // namespace

bool HasLogitsProcessing(const SamplingParams& params, const SequenceContext& context) {
  const bool suppresses =
      static_cast<int64_t>(context.output_token_ids.size()) < params.min_tokens &&
      !context.eos_token_ids.empty();  // SuppressTokensCpu
  const bool penalized = params.repetition_penalty != 1.0f ||
                         params.presence_penalty != 0.0f ||
                         params.frequency_penalty != 0.0f;  // ApplyPenaltiesCpu
  return suppresses || penalized;
}

bool IsDeviceSamplable(const SamplingParams& params, const SequenceContext& context) {
  const bool top_logprobs = params.logprobs.has_value() && *params.logprobs > 0;
  return !HasLogitsProcessing(params, context) && !top_logprobs &&
         !params.HasTokenConstraints();
}

kernels::LogitsProcessingRow DeviceLogitsProcessingRow(const SamplingParams& params,
                                                       const SequenceContext& context,
                                                       std::vector<int32_t>* ids) {
  kernels::LogitsProcessingRow row;
  const bool repetition = params.repetition_penalty != 1.0f;
  const bool counted = params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
  row.repetition_penalty = params.repetition_penalty;
  row.frequency_penalty = params.frequency_penalty;
  row.presence_penalty = params.presence_penalty;
  auto append = [ids](absl::Span<const int32_t> list, int32_t* begin, int32_t* end) {
    *begin = static_cast<int32_t>(ids->size());
    ids->insert(ids->end(), list.begin(), list.end());
    *end = static_cast<int32_t>(ids->size());
  };
  const size_t at = ids->size();
  row.prompt_begin = row.prompt_end = row.output_begin = row.output_end = row.suppress_begin =
      row.suppress_end = static_cast<int32_t>(at);
  if (repetition) append(context.prompt_token_ids, &row.prompt_begin, &row.prompt_end);
  if (repetition || counted) {
    append(context.output_token_ids, &row.output_begin, &row.output_end);
  } else {
    row.output_begin = row.output_end = static_cast<int32_t>(ids->size());
  }
  if (static_cast<int64_t>(context.output_token_ids.size()) < params.min_tokens) {
    append(context.eos_token_ids, &row.suppress_begin, &row.suppress_end);
  } else {
    row.suppress_begin = row.suppress_end = static_cast<int32_t>(ids->size());
  }
  return row;
}

bool IsPlainGreedy(const SamplingParams& params, const SequenceContext& context) {
  return params.temperature < kGreedyTemperature && IsDeviceSamplable(params, context);
}

kernels::SamplingRow DeviceSamplingRow(const SamplingParams& params, const SampleDrawKey& key) {
  kernels::SamplingRow row;
  if (params.temperature < kGreedyTemperature) return row;
  row.temperature = params.temperature;
  row.top_k = params.top_k;
  row.top_p = params.top_p;
  row.min_p = params.min_p;
  row.uniform = DrawUniform(key, kTokenDraw);
  return row;
}

PromptLogprob PromptLogprobAt(absl::Span<const float> logits, int32_t token_id,
                              int32_t num_top) {
  PromptLogprob out;
  out.token_id = token_id;
  if (token_id < 0 || static_cast<size_t>(token_id) >= logits.size()) return out;
  const double log_sum_exp = kernels::LogSumExpCpu(logits);
  const float target = logits[token_id];
  out.logprob = static_cast<float>(static_cast<double>(target) - log_sum_exp);
  int32_t above = 0;
  for (float logit : logits) above += logit > target ? 1 : 0;
  out.rank = above + 1;
  if (num_top > 0) {
    out.top_logprobs =
        kernels::TopLogprobsCpu(logits, log_sum_exp, static_cast<size_t>(num_top));
  }
  return out;
}

SampledToken SampleToken(absl::Span<float> logits, const SamplingParams& params,
                         const SequenceContext& context, const SampleDrawKey& key) {
  thread_local std::vector<float> raw;
  raw.assign(logits.begin(), logits.end());

  // Token constraints (allowed ids, bad words, logit bias) first, as vLLM's sampler; they have
  // no device form, so rows with them never reach the device samplers (HasTokenConstraints).
  if (params.HasTokenConstraints()) {
    ApplyTokenConstraints(logits, params, context.output_token_ids);
  }
  // Suppression next, as vLLM; the penalties keep -inf at -inf, so the device path may
  // suppress last (kernels/sampling/logits_processing.h).
  if (static_cast<int64_t>(context.output_token_ids.size()) < params.min_tokens) {
    kernels::SuppressTokensCpu(logits, context.eos_token_ids);
  }
  kernels::ApplyPenaltiesCpu(
      logits, {params.repetition_penalty, params.frequency_penalty, params.presence_penalty},
      context.prompt_token_ids, context.output_token_ids);

  SampledToken result;
  result.token_id =
      params.temperature < kGreedyTemperature
                          ? Argmax(logits)
                          : SampleRandom(logits, params, DrawUniform(key, kTokenDraw));
  const absl::Span<const float> raw_span(raw);
  const double log_sum_exp = kernels::LogSumExpCpu(raw_span);
  if (!raw.empty()) {
    result.logprob = static_cast<float>(static_cast<double>(raw[result.token_id]) - log_sum_exp);
  }
  if (params.logprobs.has_value() && *params.logprobs > 0) {
    result.top_logprobs =
        kernels::TopLogprobsCpu(raw_span, log_sum_exp, static_cast<size_t>(*params.logprobs));
  }
  return result;
}

}  // namespace sluice
