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
                                       const StepCostModel* draft, bool* probe_only) {
  *probe_only = false;
  ++steps_;
  if (mode_ == VerifyMode::kFixed) {
    threshold_ = 0.0;
    return max_tokens_;
  }
  const double b = target.per_token_seconds();
  const double a = target.fixed_seconds();
  const double ad = draft != nullptr ? draft->fixed_seconds() : 0.0;
  const double bd = draft != nullptr ? draft->per_token_seconds() : 0.0;
  const double batch_d = std::max(1, batch);
  const double denominator = a + b * batch_d;
  // Unpriced yet (no step measured): draft in full until the fits exist.
  threshold_ = denominator > 0.0 ? (batch_d * (b + bd) + ad) / denominator : 0.0;
  const double best = calibration_.MaxAcceptance();
  int32_t depth = 0;
  double product = 1.0;
  while (depth < max_tokens_) {
    product *= best;
    if (product < threshold_) break;
    ++depth;
  }
  if (depth > 0) {
    probe_interval_ = kProbeInterval;
    next_probe_ = steps_ + probe_interval_;
    return depth;
  }
  if (steps_ < next_probe_) return 0;
  // A probe drafts in full: it measures acceptance at every depth and spreads the step sizes
  // the cost fit sees. Each probe that finds drafting still not paying spaces the next one
  // twice as far (reset as soon as drafting pays again).
  next_probe_ = steps_ + probe_interval_;
  probe_interval_ = std::min(2 * probe_interval_, kMaxProbeInterval);
  *probe_only = true;
  return max_tokens_;
}

bool ConfidenceScheduler::KeepGoing(float confidence, double* product) const {
  *product *= calibration_.Map(confidence);
  return mode_ == VerifyMode::kFixed || *product >= threshold_;
}

int32_t ConfidenceScheduler::VerifyLength(absl::Span<const float> confidence) const {
  const int32_t n = std::min<int32_t>(static_cast<int32_t>(confidence.size()), max_tokens_);
  if (mode_ == VerifyMode::kFixed) return n;
  double product = 1.0;
  for (int32_t j = 0; j < n; ++j) {
    if (!KeepGoing(confidence[j], &product)) return j;
  }
  return n;
}

void ConfidenceScheduler::ObserveVerification(absl::Span<const float> confidence,
                                              int32_t num_verified, int32_t num_accepted) {
  for (int32_t j = 0; j < num_verified && j <= num_accepted; ++j) {
    calibration_.Observe(confidence[j], j < num_accepted);
  }
}

}  // namespace sluice
