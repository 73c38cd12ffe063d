// CPU reference of the device sampler (sampling.h). Mirrors engine/sample/sampler.cc's
// SampleToken step for step, including the order of its float64 sums, so that the same
// uniform gives the same token; kernels/ cannot depend on engine/, hence the restatement
// (tests/unit/device_sampling_test.cc checks the two agree).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kernels/sampling/sampling.h"

namespace sluice::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kInfMargin = std::numeric_limits<double>::infinity();

// Argmax with the lowest id on ties; NaN never wins; all -inf/NaN → 0.
int32_t Argmax(const float* x, int64_t n) {
  int32_t best_id = 0;
  float best = kNegInf;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > best) {
      best = x[i];
      best_id = static_cast<int32_t>(i);
    }
  }
  return best_id;
}

// log_softmax(raw)[token] in float64 over the entries > -inf (NaN skipped).
float RawLogprob(const float* raw, int64_t n, int32_t token) {
  float max_logit = kNegInf;
  for (int64_t i = 0; i < n; ++i) max_logit = std::max(max_logit, raw[i]);
  double log_sum_exp = max_logit;
  if (max_logit > kNegInf) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (raw[i] > kNegInf) sum += std::exp(static_cast<double>(raw[i]) - max_logit);
    }
    log_sum_exp = max_logit + std::log(sum);
  }
  return static_cast<float>(static_cast<double>(raw[token]) - log_sum_exp);
}

// Distance of `target` to the cumulative sums around the chosen entry, relative to `mass`.
double Margin(double before, double after, double target, double mass) {
  return std::min(after - target, target - before) / mass;
}

// Draws with the rule of sampler.cc's DrawUnsorted / DrawTopKTopP on scaled, min_p-filtered
// `x`; sets *margin.
int32_t Draw(const std::vector<float>& x, float max_logit, const SamplingRow& p, bool use_top_k,
             double* margin) {
  const auto weight = [&](int32_t id) {
    return std::exp(static_cast<double>(x[id]) - max_logit);
  };
  std::vector<int32_t> candidates;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > kNegInf) candidates.push_back(static_cast<int32_t>(i));
  }
  if (candidates.empty()) return 0;  // min_p > 1 dropped even the maximum
  if (!use_top_k && p.top_p >= 1.0f) {  // DrawUnsorted: ascending ids
    double total = 0.0;
    for (int32_t id : candidates) total += weight(id);
    const double target = p.uniform * total;
    double cumulative = 0.0;
    for (int32_t id : candidates) {
      const double before = cumulative;
      cumulative += weight(id);
      if (cumulative > target) {
        *margin = Margin(before, cumulative, target, total);
        return id;
      }
    }
    *margin = 0.0;
    return candidates.back();
  }
  // DrawTopKTopP. Rank order is a strict total order (ties → lower id), so one full sort gives
  // the sequence SampleToken's partial sorts produce.
  const auto rank = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  const int32_t top_k = use_top_k ? p.top_k : 0;
  if (top_k > 0 && static_cast<size_t>(top_k) < candidates.size()) {
    std::sort(candidates.begin(), candidates.end(), rank);
    candidates.resize(top_k);
  }
  // SampleToken sums the total in the candidates' current order: ranked after a top_k cut,
  // ascending ids otherwise.
  double total = 0.0;
  for (int32_t id : candidates) total += weight(id);
  std::sort(candidates.begin(), candidates.end(), rank);
  const size_t n = candidates.size();
  size_t keep = n;
  double kept_mass = 0.0;
  *margin = kInfMargin;
  if (p.top_p < 1.0f) {
    const double threshold = static_cast<double>(p.top_p) * total;
    bool cut = false;
    for (size_t i = 0; i < n; ++i) {
      const double before = kept_mass;
      kept_mass += weight(candidates[i]);
      if (kept_mass >= threshold) {
        keep = i + 1;
        *margin = Margin(before, kept_mass, threshold, total);
        cut = true;
        break;
      }
    }
    if (!cut) *margin = 0.0;
  } else {
    kept_mass = total;
  }
  const double target = p.uniform * kept_mass;
  double cumulative = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const double before = cumulative;
    cumulative += weight(candidates[i]);
    if (cumulative > target) {
      *margin = std::min(*margin, Margin(before, cumulative, target, kept_mass));
      return candidates[i];
    }
  }
  *margin = 0.0;
  return candidates[keep - 1];
}

}  // namespace

SampleRowResult SampleRowCpu(const float* logits, int64_t vocab, const SamplingRow& params) {
  SampleRowResult result;
  result.margin = kInfMargin;
  if (vocab < 1) return result;
  if (params.temperature < kGreedyTemperature) {
    result.token = Argmax(logits, vocab);
  } else {
    std::vector<float> x(logits, logits + vocab);
    if (params.temperature != 1.0f) {
      for (float& v : x) v /= params.temperature;
    }
    float max_logit = kNegInf;
    for (float v : x) max_logit = std::max(max_logit, v);
    if (!(max_logit > kNegInf)) {
      result.token = Argmax(x.data(), vocab);
    } else {
      if (params.min_p > 0.0f) {
        const double log_min_p = std::log(static_cast<double>(params.min_p));
        for (float& v : x) {
          if (static_cast<double>(v) - max_logit < log_min_p) v = kNegInf;
        }
      }
      const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
      result.token = Draw(x, max_logit, params, use_top_k, &result.margin);
    }
  }
  result.logprob = RawLogprob(logits, vocab, result.token);
  return result;
}

void SampleRowsCpu(const float* logits, int64_t rows, int64_t vocab, const SamplingRow* params,
                   int32_t* tokens, float* logprobs) {
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRowResult result = SampleRowCpu(logits + r * vocab, vocab, params[r]);
    tokens[r] = result.token;
    logprobs[r] = result.logprob;
  }
}

}  // namespace sluice::kernels
