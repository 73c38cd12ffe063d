#include "engine/spec/speculative.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace sluice {

absl::Status SpeculativeOptions::Validate() const {
  if (num_speculative_tokens < 1 || num_speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-speculative-tokens must be in [1, ", kMaxSpeculativeTokens,
                     "], got ", num_speculative_tokens));
  }
  return absl::OkStatus();
}

absl::Status ParseVerifyMode(const std::string& text, VerifyMode* mode, int32_t* k) {
  if (text == "auto") {
    *mode = VerifyMode::kAuto;
    return absl::OkStatus();
  }
  int32_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1 ||
      value > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-verify must be auto or a fixed draft count in [1, ",
        kMaxSpeculativeTokens, "], got '", text, "'"));
  }
  *mode = VerifyMode::kFixed;
  *k = value;
  return absl::OkStatus();
}

int ConfidenceCalibration::Bin(float confidence) {
  const int b = static_cast<int>(std::floor(static_cast<double>(confidence) * kBins));
  return std::clamp(b, 0, kBins - 1);
}

double ConfidenceCalibration::Map(float confidence) const {
  const int b = Bin(confidence);
  const double centre = (b + 0.5) / kBins;
  return (accepted_[b] + kPriorWeight * centre) / (total_[b] + kPriorWeight);
}

void ConfidenceCalibration::Observe(float confidence, bool accepted) {
  const int b = Bin(confidence);
  total_[b] += 1.0;
  accepted_[b] += accepted ? 1.0 : 0.0;
}

double ConfidenceCalibration::MaxAcceptance() const {
  double best = 0.0;
  for (int b = 0; b < kBins; ++b) {
    best = std::max(best, Map(static_cast<float>((b + 0.5) / kBins)));
  }
  return best;
}

int32_t ConfidenceScheduler::BeginStep(int32_t batch, const StepCostModel& target,
                                       const StepCostModel* draft, bool* probe_only,
                                       Baseline baseline) {
  *probe_only = false;
  probing_ = false;
  ++steps_;
  rate_ = draft_threshold_ = verify_threshold_ = 0.0;
  planned_length_ = max_tokens_;
  if (mode_ == VerifyMode::kFixed) return max_tokens_;
  if (baseline == Baseline::kMeasuring) {
    probing_ = true;  // every sequence, in full
    return max_tokens_;
  }
  const bool pipelined = baseline == Baseline::kPipelined;
  const double b = target.per_token_seconds();
  const double a = target.fixed_seconds();
  const double ad = draft != nullptr ? draft->fixed_seconds() : 0.0;
  const double bd = draft != nullptr ? draft->per_token_seconds() : 0.0;
  const double batch_d = std::max(1, batch);
  // Unpriced (no decode step measured) or the split of the step cost into fixed and per-token
  // unknown (every measured step had the same size): probe — a few sequences draft and verify
  // in full, which also gives the fit steps of another size.
  if (a + b * batch_d <= 0.0 || !target.Identified()) {
    *probe_only = !pipelined;  // beside pipelined steps there is no cheaper plan to fall back on
    probing_ = true;
    return max_tokens_;
  }
  // Per sequence: a step without drafts costs a/B + b; each draft adds its verification row
  // and its share of a draft round.
  const double plain_cost = a / batch_d + b;
  const double draft_cost = b + bd + ad / batch_d;
  double tokens = 1.0, cost = plain_cost, product = 1.0;
  double best_rate = pipelined ? 0.0 : tokens / cost;  // L = 0 only against synchronous steps
  int32_t best_length = 0;
  for (int32_t length = 1; length <= max_tokens_; ++length) {
    product *= DepthAcceptance(length);
    tokens += product;
    cost += draft_cost;
    if (tokens / cost > best_rate) {
      best_rate = tokens / cost;
      best_length = length;
    }
  }
  rate_ = best_rate;
  draft_threshold_ = best_rate * draft_cost;
  verify_threshold_ = best_rate * b;
  planned_length_ = best_length;
  if (best_length > 0) {
    probe_interval_ = kProbeInterval;
    next_probe_ = steps_ + probe_interval_;
    return max_tokens_;
  }
  if (steps_ < next_probe_) return 0;
  // A probe drafts and verifies in full: it measures acceptance at every depth and spreads the
  // step sizes the cost fits see. Each probe that finds drafting still not paying spaces the
  // next one twice as far (reset as soon as drafting pays again).
  next_probe_ = steps_ + probe_interval_;
  probe_interval_ = std::min(2 * probe_interval_, kMaxProbeInterval);
  *probe_only = true;
  probing_ = true;
  return max_tokens_;
}

bool ConfidenceScheduler::KeepGoing(int32_t j, float confidence, double* product) const {
  *product *= calibration_.Map(confidence);
  if (mode_ == VerifyMode::kFixed || probing_) return true;
  if (j + 2 > kMaxSpeculativeTokens) return false;
  return *product * DepthAcceptance(j + 2) >= draft_threshold_;
}

int32_t ConfidenceScheduler::VerifyLength(absl::Span<const float> confidence) const {
  const int32_t n = std::min<int32_t>(static_cast<int32_t>(confidence.size()), max_tokens_);
  if (mode_ == VerifyMode::kFixed || probing_) return n;
  double product = 1.0;
  for (int32_t j = 0; j < n; ++j) {
    product *= calibration_.Map(confidence[j]);
    if (product < verify_threshold_) return j;
  }
  return n;
}

double ConfidenceScheduler::DepthAcceptance(int32_t depth) const {
  const int32_t i = std::clamp(depth, 1, kMaxSpeculativeTokens) - 1;
  return (depth_sum_[i] + kDepthPrior * kDepthPriorMean) / (depth_weight_[i] + kDepthPrior);
}

void ConfidenceScheduler::ObserveDrafts(absl::Span<const float> confidence) {
  // Recent drafts weigh most: the drafter's confidence drifts with the workload.
  constexpr double kDecay = 0.995;
  const size_t n = std::min<size_t>(confidence.size(), kMaxSpeculativeTokens);
  for (size_t i = 0; i < n; ++i) {
    depth_sum_[i] = kDecay * depth_sum_[i] + calibration_.Map(confidence[i]);
    depth_weight_[i] = kDecay * depth_weight_[i] + 1.0;
  }
}

void ConfidenceScheduler::ObserveVerification(absl::Span<const float> confidence,
                                              int32_t num_verified, int32_t num_accepted) {
  for (int32_t j = 0; j < num_verified && j <= num_accepted; ++j) {
    calibration_.Observe(confidence[j], j < num_accepted);
  }
}

}  // namespace sluice
