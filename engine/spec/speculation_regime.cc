#include "engine/spec/speculation_regime.h"

#include <algorithm>
#include <cmath>

namespace sluice {

void SpeculationRegime::Start(bool pipelined, Phase phase) {
  if (pipelined != pipelined_) ++num_switches_;
  pipelined_ = pipelined;
  phase_ = phase;
  full_retry_ = false;
  phase_steps_ = 0;
  // A measurement starts afresh; the regime that runs on keeps its running rate.
  if (phase != Phase::kExploit) rate_[pipelined ? 1 : 0] = Rate{};
  if (!pipelined) new_since_measured_ = 0;
  window_.clear();
}

void SpeculationRegime::NoteNewSequences(int64_t count, int64_t decoding) {
  // Sequences that start while speculation runs are measured by it.
  if (count <= 0 || !pipelined_) return;
  new_since_measured_ += count;
  if (phase_ == Phase::kExploit && decoding <= kTurnoverMaxSequences &&
      2 * new_since_measured_ >= decoding &&
      rate_[0].Value() >= kTurnoverRetryRatio * rate_[1].Value()) {
    retry_interval_ = kRetryInterval;
    Start(false, Phase::kRetry);
    full_retry_ = true;
  }
}

SpeculationRegime::Rate SpeculationRegime::MeasuredRate() const {
  std::vector<double> seconds;
  for (const Step& s : window_) seconds.push_back(s.seconds);
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  const double limit = kOutlierFactor * seconds[seconds.size() / 2];
  Rate rate;
  for (const Step& s : window_) {
    if (s.seconds > limit) continue;
    rate.tokens += s.tokens;
    rate.sequence_seconds += s.seconds * s.sequences;
  }
  return rate;
}

void SpeculationRegime::Observe(double seconds, int64_t tokens, int64_t sequences) {
  if (sequences <= 0 || !(seconds > 0.0)) return;
  Rate& rate = rate_[pipelined_ ? 1 : 0];
  ++phase_steps_;
  if (phase_ == Phase::kExploit) {
    rate.tokens = kDecay * rate.tokens + static_cast<double>(tokens);
    rate.sequence_seconds = kDecay * rate.sequence_seconds + seconds * static_cast<double>(sequences);
    if (phase_steps_ >= retry_interval_) Start(!pipelined_, Phase::kRetry);
    return;
  }
  if (phase_steps_ > 1) {  // the first step of a measurement may be the switch itself
    window_.push_back(Step{seconds, static_cast<double>(tokens), static_cast<double>(sequences)});
    rate = MeasuredRate();
  }
  const double retried = rate_[pipelined_ ? 1 : 0].Value();
  const double running = rate_[pipelined_ ? 0 : 1].Value();
  // A retry far behind the running regime stops early: it only costs.
  const bool abandon = phase_ == Phase::kRetry && phase_steps_ > kMinRetrySteps &&
                       retried < kAbandonRatio * running;
  if (phase_steps_ < kMeasureSteps && !abandon) return;
  const bool pipelined_wins = rate_[1].Value() > rate_[0].Value();
  switch (phase_) {
    case Phase::kFirst:
      Start(true, Phase::kSecond);
      return;
    case Phase::kSecond:
      Start(pipelined_wins, Phase::kExploit);
      return;
    case Phase::kRetry:
      if (pipelined_wins == pipelined_) {
        retry_interval_ = kRetryInterval;  // the retried regime won: it runs now
      } else {
        // Spaced by the factor it lost by (at least 2): a retry costs about kMeasureSteps
        // steps of the slower rate.
        const double factor = std::max(2.0, retried > 0.0 ? running / retried : 64.0);
        retry_interval_ = std::min(kMaxRetryInterval,
                                   static_cast<int64_t>(std::lround(factor * retry_interval_)));
      }
      Start(pipelined_wins, Phase::kExploit);
      return;
    case Phase::kExploit:
      return;
  }
}

}  // namespace sluice
